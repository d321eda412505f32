from voice_llm.cli import main

raise SystemExit(main())
