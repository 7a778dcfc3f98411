"""Engine-neutral runtime pieces (torch, no inference engine): the counts export over Gloo."""
