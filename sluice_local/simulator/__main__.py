"""`python -m sluice_local.simulator`: run the simulator until interrupted."""

from sluice_local.simulator.app import main

raise SystemExit(main())
