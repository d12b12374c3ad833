from .loop import train_draft_main

raise SystemExit(train_draft_main())
