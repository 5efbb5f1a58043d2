from simpletuner.cli import main

raise SystemExit(main())
