"""rankscope for training frameworks that own the loop: one line each.

    from rankscope.integrations.transformers import RankscopeCallback   # transformers.Trainer
    from rankscope.integrations.lightning import RankscopeCallback      # lightning.pytorch.Trainer

Each module imports its framework only when it is imported itself: rankscope never
requires them."""
