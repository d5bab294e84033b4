"""``release verify``: a build against the reference layout and its source, as a report and a gate."""
