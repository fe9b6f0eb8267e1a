"""``python -m meshnet.tracker``: run a tracker process (the same flags as ``meshnet tracker``)."""

from meshnet.tracker.server import tracker_main

raise SystemExit(tracker_main())
