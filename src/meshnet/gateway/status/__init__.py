"""The swarm's status in one home: the document (view), the page and its live stream, the terminal table."""
