"""Built-in tasks. Each module holds one task; `sim.registry` names them."""
