"""Drafters: anything that proposes tokens for the target to verify (`base`); the draft model (`model`),
prompt lookup (`ngram`), the suffix drafter (`suffix`) and a draft of another tokenizer (`xtok`). Which
drafter a name means is `specdec.catalogue`."""
