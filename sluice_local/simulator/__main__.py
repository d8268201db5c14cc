"""`python -m sluice_local.simulator`: run the simulator until interrupted."""

from sluice_local.sim_options import main

raise SystemExit(main())
