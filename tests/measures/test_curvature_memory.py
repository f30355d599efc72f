"""The peak memory of the curvature measures, worked out on the meta device, against the
same measures run for real on the CPU and against arithmetic that must hold."""

from __future__ import annotations

import pytest
import torch

from sameloss.errors import UserError
from sameloss.measures.curvature import FixedBatch, sam_sharpness, top_eigenvalue, trace_hutchinson
from sameloss.measures.curvature.memory import StorageTracker, peak_bytes, stand_in_batch
from sameloss.models import transformer_config


@pytest.fixture(scope="module")
def config():
    return transformer_config("micro", 27, 8, dropout=0.0, attn_dropout=0.0)


def test_the_tracker_counts_live_storages_once():
    with StorageTracker() as t:
        a = torch.empty(1000, device="meta")  # 4000 bytes
        b = a.view(10, 100)  # the same storage
        c = torch.empty(500, device="meta")  # 2000
        del a
        d = torch.empty(250, device="meta")  # a still alive through b: 7000
        del b, c
        e = torch.empty(2000, device="meta")  # 1000 + 8000
    assert t.peak == 9000 and t.current == 9000
    del d, e


@pytest.mark.parametrize("measure", ["trace_hutchinson", "trace_hutchpp", "top_eigenvalue", "sam_sharpness"])
def test_the_meta_estimate_is_the_peak_of_a_real_run(config, measure):
    """The same code run for real on the CPU (a micro model, 48 sentences), its CPU
    storages followed by the same tracker: the estimate on the meta device matches it."""
    from sameloss.models import TransformerMLM

    torch.manual_seed(0)
    model = TransformerMLM(config)
    batch = stand_in_batch(config, 48)
    batch.inputs.random_(0, 24)
    fixed = FixedBatch(batch=batch)
    runs = {"trace_hutchinson": lambda: trace_hutchinson(model, None, fixed, n_probes=8, probe_chunk=8),
            "trace_hutchpp": lambda: trace_hutchinson(model, None, fixed, n_probes=12, probe_chunk=4,
                                                      estimator="hutchpp"),
            "top_eigenvalue": lambda: top_eigenvalue(model, None, fixed, max_iter=4, basis_size=2, tol=0),
            "sam_sharpness": lambda: sam_sharpness(model, None, batch=batch)}
    settings = {"trace_hutchinson": {"n_sentences": 48, "n_probes": 8, "probe_chunk": 8},
                "trace_hutchpp": {"n_sentences": 48, "n_probes": 12, "probe_chunk": 4},
                "top_eigenvalue": {"n_sentences": 48, "basis_size": 2, "max_iter": 4},
                "sam_sharpness": {"n_sentences": 48}}
    with StorageTracker("cpu") as real:
        runs[measure]()
    estimate = peak_bytes(measure, config, settings[measure])
    # the CPU run also holds the batch's and the draws' host tensors (a few kB)
    assert estimate.parts["working"] == pytest.approx(real.peak, rel=0.05), (estimate, real.peak)
    assert estimate.parts["weights"] == 4 * model.num_parameters() == 4 * estimate.n_params


def test_lanczos_memory_is_bounded_by_its_basis(config):
    small = peak_bytes("top_eigenvalue", config, {"basis_size": 10, "n_sentences": 16})
    large = peak_bytes("top_eigenvalue", config, {"basis_size": 30, "n_sentences": 16})
    P = small.n_params
    assert large.bytes - small.bytes == 20 * P * 4  # one float32 vector per basis vector
    many = peak_bytes("top_eigenvalue", config, {"basis_size": 10, "max_iter": 300, "n_sentences": 16})
    assert many.bytes == small.bytes  # products beyond the basis restart it: no more memory


def test_micro_batches_bound_the_hessian_graph(config):
    whole = peak_bytes("trace_hutchinson", config, {"n_sentences": 256})
    micro = peak_bytes("trace_hutchinson", config, {"n_sentences": 256, "micro_batch": 16})
    assert micro.parts["working"] < whole.parts["working"] / 4
    with pytest.raises(UserError, match="unknown curvature measure"):
        peak_bytes("trace_exact", config)
    with pytest.raises(UserError, match="unknown setting"):
        peak_bytes("sam_sharpness", config, {"rho": 0.1})


def test_the_curvature_measures_read_their_device_once_or_once_per_step(config):
    """On the meta device every read of a value is counted (``stand_in_reads``): the trace
    estimators read once at the end however many probes they take; Lanczos once per
    product (its stopping test); the Fisher estimator once per block of contexts (the
    labels are drawn on the host) and at the end."""
    from sameloss.measures.curvature import MatrixOperator, hutchinson_trace, hutchpp_trace, lanczos_top_eigenvalue
    from sameloss.measures.curvature.memory import meta_model, meta_probes, stand_in_reads
    from sameloss.measures.curvature import FisherContexts, trace_fisher

    A = MatrixOperator(torch.empty(50, 50, device="meta"))
    for probes in (8, 40):
        for estimator in (hutchinson_trace, hutchpp_trace):
            reads: list = []
            with stand_in_reads(reads), meta_probes():
                estimator(A, probes, chunk=4)
            assert reads == ["tolist"], (estimator.__name__, probes, reads)
    reads = []
    with stand_in_reads(reads), meta_probes():
        r = lanczos_top_eigenvalue(A, max_iter=12, basis_size=5)
    assert r.iterations == 12 and reads == ["tolist"] * 12
    model = meta_model(config)
    for n, block in ((16, 16), (48, 16)):
        reads = []
        with stand_in_reads(reads):
            trace_fisher(model, None, FisherContexts(batch=stand_in_batch(config, n), block_size=block), n_labels=3,
                         repeats=2)
        assert reads.count("cpu") == 2 * n // block + 1 and reads.count("tolist") == 1, (n, reads)
    reads = []
    with stand_in_reads(reads), meta_probes():
        trace_hutchinson(model, None, FixedBatch(batch=stand_in_batch(config, 16)), n_probes=12, probe_chunk=4,
                         by_block=True)
    assert reads == ["tolist", "__float__"]  # the estimate table and the loss, at the end
