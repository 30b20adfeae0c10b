"""K policies: how many tokens to draft each round. `base`: the protocol and the simple policies; `cost`: the
cost policy and its ledger; `batch`: one K per round for a batch. Which policy a name means is
`specdec.catalogue`."""
