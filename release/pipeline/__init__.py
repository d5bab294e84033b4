"""Commands that span stages: ``release build`` (:mod:`.sweep`: each build made and verified as soon as it is made)
and ``release campaign`` (:mod:`.campaign`: the sweep, its evaluations, tables, selection and cards)."""
