from ferry.cli import main

raise SystemExit(main())
