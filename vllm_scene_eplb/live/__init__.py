"""A running server's layout judged live: ``fitness`` (live layout fitness and the drift alarm) and
``measured`` (measured replica traffic, dispatch fidelity, rank MoE time); pure numpy."""
