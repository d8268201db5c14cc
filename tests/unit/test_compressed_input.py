"""A compressed input is refused with a command that decompresses it, whatever the file is named."""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from sluice_local.console import EXIT_INPUT, CliError
from sluice_local.inputs import refuse_compressed

PLAIN = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'


def _gzip(path: Path) -> None:
    path.write_bytes(gzip.compress(PLAIN))


def _zip(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("in.jsonl", PLAIN)


def _zstd(path: Path) -> None:
    plain = path.with_name("plain-source")
    plain.write_bytes(PLAIN)
    subprocess.run(["zstd", "-q", str(plain), "-o", str(path)], check=True)


@pytest.mark.parametrize(
    ("name", "compress", "tool"),
    [
        # `gunzip -k in.jsonl` fails: "unknown suffix -- ignored"
        ("in.jsonl", _gzip, "gunzip"),
        ("in.jsonl.gz", _gzip, "gunzip"),
        ("my input.jsonl", _gzip, "gunzip"),
        ("in.jsonl", _zstd, "zstd"),
        ("in.jsonl.zip", _zip, "unzip"),
    ],
)
def test_the_command_suggested_decompresses_the_file(name: str, compress: object, tool: str, tmp_path: Path) -> None:
    if shutil.which(tool) is None:
        pytest.skip(f"no {tool} here")
    path = tmp_path / name
    compress(path)  # type: ignore[operator]
    with pytest.raises(CliError) as refused:
        refuse_compressed(path)
    assert refused.value.code == EXIT_INPUT
    command = re.search(r"decompress it first \((.+)\)$", str(refused.value))
    assert command is not None, str(refused.value)
    ran = subprocess.run(command.group(1), shell=True, cwd=tmp_path, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    made = {p for p in tmp_path.iterdir() if p.read_bytes() == PLAIN and p.name != "plain-source"}
    assert len(made) == 1 and next(iter(made)) != path
