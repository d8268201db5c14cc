"""How each SLUICE_* variable's text becomes its setting: one small parser per kind of value.

A parser is given the variable's name and its text (never empty: an unset variable keeps its
setting's default) and returns the value, or raises `SettingsError` naming the variable.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .status import parse_validate

Parser = Callable[[str, str], Any]


class SettingsError(RuntimeError):
    pass


def parse_error_rate(raw: str) -> float:
    """A share of a job's requests, 0 to 1 (0.01 = 1%); ValueError says what is wrong."""
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("expected a number from 0 to 1, such as 0.01 for 1%") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError("expected a number from 0 to 1, such as 0.01 for 1%")
    return value


def queue_tokens_text(limits: Mapping[str, int]) -> str:
    """Per-model queue limits as the one-line text `parse_queue_tokens` reads."""
    return ",".join(f"{model}={tokens}" for model, tokens in limits.items())


def parse_queue_tokens(text: str) -> dict[str, int]:
    """`model=tokens,model=tokens` (0 = no limit); ValueError says what is wrong."""
    limits: dict[str, int] = {}
    for entry in filter(None, (part.strip() for part in text.split(","))):
        model, sep, tokens = entry.rpartition("=")
        if not sep or not model or not tokens.isdigit():
            raise ValueError(f"expected model=tokens (a whole number, 0 for none), got {entry!r}")
        limits[model] = int(tokens)
    return limits


# The job row counts a budget in whole nano-dollars (`sluice.limits.budget`); a billion dollars is
# 1e18 of them, within a signed 64-bit integer and DynamoDB's 38 digits, where 1e30 dollars is not
MAX_BUDGET_USD = 1e9


def parse_budget(raw: str) -> float:
    """A spending cap in US dollars: a number above 0, up to MAX_BUDGET_USD; ValueError says what is wrong."""
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        raise ValueError(f"{raw!r} is not an amount of US dollars above 0, such as 12.50")
    if value > MAX_BUDGET_USD:
        raise ValueError(f"{raw!r} is more than the largest budget Sluice counts, ${MAX_BUDGET_USD:,.0f}")
    return value


def parse_prices(text: str | None) -> dict[str, tuple[float, ...]]:
    """`{"<model>": [input, output]}` or `[input, output, cached input, cache write]` (JSON, USD per
    million tokens), what `SLUICE_PRICES` overrides; ValueError says what is wrong."""
    if not text:
        return {}
    try:
        raw = json.loads(text)
    except ValueError:
        raise ValueError('expected a JSON object of models, such as {"my-finetune": [0.3, 1.2]}') from None
    if not isinstance(raw, dict):
        raise ValueError('expected an object of models, such as {"my-finetune": [0.3, 1.2]}')
    prices: dict[str, tuple[float, ...]] = {}
    for model, values in raw.items():
        numbers = isinstance(values, list) and all(
            isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in values
        )
        if not numbers or not 2 <= len(values) <= 4:
            raise ValueError(
                f"{model}: expected [input, output] or [input, output, cached input, cache write], none below 0"
            )
        prices[str(model)] = tuple(float(v) for v in values)
    return prices


@dataclass(frozen=True)
class RateSeed:
    """A provider's limits for one model, per minute, as configured: they seed the shared limit
    until the provider's headers say otherwise (0 = not configured)."""

    rpm: float = 0
    tpm: float = 0


def parse_rate_limits(text: str | None) -> dict[str, RateSeed]:
    """`{"<model>": {"rpm": 30000, "tpm": 150000000}, ...}` (JSON); ValueError says what is wrong.
    A model's `rpm` is required, its `tpm` optional."""
    if not text:
        return {}
    try:
        raw = json.loads(text)
    except ValueError:
        raise ValueError('expected a JSON object of models, such as {"gpt-4o-mini": {"rpm": 30000}}') from None
    if not isinstance(raw, dict):
        raise ValueError('expected an object of models, such as {"gpt-4o-mini": {"rpm": 30000}}')
    seeds: dict[str, RateSeed] = {}
    for model, limits in raw.items():
        if not isinstance(limits, dict) or set(limits) - {"rpm", "tpm"} or "rpm" not in limits:
            raise ValueError(f'{model}: expected {{"rpm": <requests a minute>, "tpm": <tokens a minute>}}')
        values = [limits.get("rpm"), limits.get("tpm", 0)]
        if any(type(v) not in (int, float) or not math.isfinite(v) or v < 0 for v in values) or not values[0]:
            raise ValueError(f"{model}: rpm must be a positive number and tpm a number >= 0")
        seeds[str(model)] = RateSeed(float(values[0]), float(values[1]))
    return seeds


def text(name: str, raw: str) -> str:
    return raw


def _positive(kind: type[int] | type[float], name: str, raw: str) -> float:
    try:
        value = kind(raw)
    except ValueError as exc:
        raise SettingsError(f"{name}={raw!r} is not a {kind.__name__}") from exc
    if value <= 0:
        raise SettingsError(f"{name} must be positive, got {raw}")
    return value


def positive_int(name: str, raw: str) -> int:
    return int(_positive(int, name, raw))


def positive_float(name: str, raw: str) -> float:
    return _positive(float, name, raw)


def limit(name: str, raw: str) -> int:
    """A whole number where 0 means no limit."""
    if not raw.isdigit():
        raise SettingsError(f"{name}={raw!r} is not a whole number (0 means no limit)")
    return int(raw)


def days(name: str, raw: str) -> int:
    if not raw.isdigit():
        raise SettingsError(f"{name}={raw!r} is not a whole number of days (0 means never)")
    return int(raw)


def one_of(choices: tuple[str, ...]) -> Parser:
    def choice(name: str, raw: str) -> str:
        if raw not in choices:
            raise SettingsError(f"{name}={raw!r}; expected one of {', '.join(choices)}")
        return raw

    return choice


def usd(name: str, raw: str) -> float:
    """A budget in US dollars, 0 for none."""
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= MAX_BUDGET_USD:
        raise SettingsError(
            f"{name}={raw!r} is not an amount of US dollars up to {MAX_BUDGET_USD:,.0f} (0 means no budget)"
        )
    return value


def _checked(convert: Callable[[str], Any], *, keep_text: bool = False, show_value: bool = True) -> Parser:
    """A parser of a function that raises ValueError saying what is wrong. `keep_text`: the setting
    is the variable's text, once it converts (its readers convert it where they use it);
    `show_value`: the error repeats the text, unless it is long and the reason says where."""

    def parse(name: str, raw: str) -> Any:
        try:
            value = convert(raw)
        except ValueError as exc:
            raise SettingsError(f"{name}={raw!r}: {exc}" if show_value else f"{name}: {exc}") from exc
        return raw if keep_text else value

    return parse


error_rate = _checked(parse_error_rate)
# `Settings.batch_queue_limit` reads it
queue_tokens = _checked(parse_queue_tokens, keep_text=True)
rate_limits = _checked(parse_rate_limits, keep_text=True, show_value=False)
# validation checks, as the comma-separated names `parse_validate` reads back
checks = _checked(lambda raw: ",".join(parse_validate(raw)))
