"""The online sweep: the clocks a profiling scheduler measures, and what it makes of them.

Its parts, in the order a profile flows through them:

- `instruction_sweep`: `InstructionSweep`, the state machine the profiling schedulers share
  (warm-up, sweep high → low, refine, confirm), and the profile it hands on;
- `levels`: which clocks a pass measures and how many iterations a round needs;
- `followup`: the refine and confirm passes (skipped clocks near a hull's bends, options
  whose uncertainty could change the plan);
- `power_fit`: what a GPU shows turned into powers: each GPU's (stage, kind, clock) power
  curves, blocking power and power after work stops, fitted to the energy counter's
  windows, within idle and the power limit;
- `option_estimates`: `SweepEstimates`, each option's energy and standard error from that
  fit, and the rows no GPU can draw, left out and said;
- `row_times`: the rows whose time is not their clock's (every instruction started while a
  clock change landed, or a lower clock that runs faster), left out and said;
- `products`: the profile's rows and `profiling.json`.

The modules are imported by their names (nothing is re-exported here: `power_fit` is also
read by the measurement of a round, which the state machine imports).
"""
