"""One module per group of subcommands; each registers its parsers and handlers."""
