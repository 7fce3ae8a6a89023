from engine.gpu_check.cli import main

raise SystemExit(main())
