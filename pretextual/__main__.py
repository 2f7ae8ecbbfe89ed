from pretextual.cli import main

raise SystemExit(main())
