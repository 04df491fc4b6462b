"""ndcost's built-in plugins: each module is its own entry point of the ``ndcost.plugins`` group."""
