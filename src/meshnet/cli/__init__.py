"""The `meshnet` command: one subcommand per component, flags generated from its typed config."""
