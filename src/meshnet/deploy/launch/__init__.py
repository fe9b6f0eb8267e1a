"""Starting a component as a process: the argv rendered from its typed config (``commands``) and
the ready line it prints once it serves (``ready_lines``), each written once for every launcher."""
