import sys

from local.cli.app import main

sys.exit(main())
