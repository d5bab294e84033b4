"""What a release starts from: the BF16 source checkpoint, the DROID observations, the policy that runs one on
the other, LeRobot imports and the tiny/nano fixture that makes a source and observations."""
