"""CLI subcommands, one module each: ``HELP``, ``add_arguments(parser)`` and ``run(args) -> Output``."""
