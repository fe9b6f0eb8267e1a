"""``python -m meshnet``: the ``meshnet`` command, as launchers start every component."""

from meshnet.cli.main import main

raise SystemExit(main())
