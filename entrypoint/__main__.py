from entrypoint.cli import main

raise SystemExit(main())
