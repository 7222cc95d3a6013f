"""The engine a run goes through. One entry point: `sim.engine.core.run_engine(specs, ...)`
-> `EngineResult` (what `sim.runs.run` calls). Inside, one SimPy process steps a vLLM-v1-style
loop, and its parts hand each other named records, as vLLM's do:

- the client (`client.Client`) submits each `request.Request` to `core.Engine.submit`, which
  hands it to `scheduler.Scheduler.add` (or rejects it with a reason);
- `Scheduler.schedule` returns one `step_plan.StepPlan` (vLLM's `SchedulerOutput`) per step;
- the engine turns it into `step_trace.BatchTotals`, which `step_prices.StepPrices.price`
  prices through `sim.pricing` into a `step_prices.PricedStep` (duration and row);
- after that duration `Scheduler.update_from_output(plan, ...)` processes the step's outputs
  and returns the requests it finished; with the API server's loop modelled,
  `frontend_steps.candidates` / `serve` hand it the step's `PlacedOutputs` and time the
  first and last outputs the client sees;
- a stretch of steady decode steps is advanced at once (`decode_run.DecodeRuns.advance`, over
  the scheduler's `decode_group.DecodeGroup`), the same records in arrays;
- every step lands in `metrics.StepLog` (and, traced, `step_trace`).

Outside the package only the entry point and the records others read (budget, pool, memory,
metrics, step trace, acceptance, vLLM version) are imported; the loop's parts are not
(`tests/test_layering.py`, ENGINE_PARTS).

Layer: may import `sim.pricing` (and `core`, `policies`, `workloads`).
"""
