import sys

from sluice_local.cli.app import main

sys.exit(main())
