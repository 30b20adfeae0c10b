"""The benchmark half: prompts, settings, plan, the method registry, the runner, cost measurement and the store.

`specdec.bench.sweep` is the public face of the sweep; docs/DESIGN.md ("The benchmark half") has the module map.
"""
