"""`python -m local.simulator`: run the simulator until interrupted."""

from local.simulator.app import main

raise SystemExit(main())
