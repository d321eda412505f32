from voice_llm.cli.main import main

raise SystemExit(main())
