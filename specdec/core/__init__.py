"""The pure pieces every part uses, with no model, file or clock: warping and sampling (`sampling`), the
verification rule (`verification`), per-round records and the rates derived from them (`metrics`), the
analytical model (`theory`), the measured cost curve and its one rule (`costs`), and intervals over units
(`stats`)."""
