"""Arrival processes as vLLM's serving benchmark draws them, and trace replay."""
import numpy as np
import pytest

from workloads.arrivals import gamma_arrival_times, trace_arrival_times
from workloads.base import RequestSpec, WorkloadError

N = 10_001  # 10,000 gaps


@pytest.mark.parametrize("rate", [0.5, 4.0, 100.0])
@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_mean_rate_within_5_percent(rate, burstiness):
    t = gamma_arrival_times(N, rate, burstiness, np.random.default_rng(1))
    assert t[0] > 0.0 and np.all(np.diff(t) >= 0)  # vLLM waits a gap before the first request too
    assert t[-1] == pytest.approx(N / rate)  # rescaled: the last send at n / rate


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_burstiness_sets_the_coefficient_of_variation(burstiness):
    gaps = np.diff(gamma_arrival_times(N, 2.0, burstiness, np.random.default_rng(2)))
    # Gamma(shape k): CV = 1 / sqrt(k); Poisson (k = 1) has CV 1, k < 1 is burstier
    assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.05)


def test_draws_are_vllms_gamma_and_seeded():
    rate, k = 3.0, 0.5
    t = gamma_arrival_times(5, rate, k, np.random.default_rng(7))
    gaps = np.random.default_rng(7).gamma(shape=k, scale=1 / (rate * k), size=5)
    assert np.allclose(t, np.cumsum(gaps) * (5 / rate) / gaps.sum())  # get_request's normalize_factor
    poisson = gamma_arrival_times(50, 2.0, 1.0, np.random.default_rng(3))  # burstiness 1
    expo = np.random.default_rng(3).exponential(scale=0.5, size=50)
    assert np.allclose(poisson, np.cumsum(expo) * 25 / expo.sum())
    assert np.array_equal(gamma_arrival_times(0, 1.0, 1.0, np.random.default_rng(0)), np.zeros(0))
    assert np.array_equal(gamma_arrival_times(4, float("inf"), 1.0, np.random.default_rng(0)), np.zeros(4))


@pytest.mark.parametrize("rate,burstiness,match", [(0, 1, "request_rate"), (-1, 1, "request_rate"),
                                                   (1, 0, "burstiness"), (1, float("nan"), "burstiness")])
def test_bad_arrival_parameters(rate, burstiness, match):
    with pytest.raises(WorkloadError, match=match):
        gamma_arrival_times(10, rate, burstiness, np.random.default_rng(0))


def reqs(times):
    return [RequestSpec(i, 10, 10, arrival_s=t) for i, t in enumerate(times)]


def test_trace_replay_relative_and_scaled():
    assert trace_arrival_times(reqs([100.0, 101.0, 104.0]), 1.0).tolist() == [0.0, 1.0, 4.0]
    assert trace_arrival_times(reqs([100.0, 101.0, 104.0]), 0.5).tolist() == [0.0, 0.5, 2.0]
    with pytest.raises(WorkloadError, match="not a trace"):
        trace_arrival_times(reqs([0.0, None]), 1.0)
    with pytest.raises(WorkloadError, match="must not decrease: request 2"):
        trace_arrival_times(reqs([0.0, 5.0, 4.0]), 1.0)
    with pytest.raises(WorkloadError, match="time_scale"):
        trace_arrival_times(reqs([0.0]), 0.0)
