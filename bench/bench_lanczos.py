"""Benchmark: the accuracy thick-restart Lanczos keeps with a small basis.

``lanczos_top_eigenvalue`` keeps ``basis_size + 1`` vectors (before issue 26: all
``max_iter`` of them, in float64, re-stacked every product). On dense symmetric matrices
of dimension ``--dim`` with known spectra — a clear gap, a small relative gap, a cluster
at the top, a Hessian-like power law with a few outliers, and a top eigenvalue smaller in
magnitude than the bottom one — it is run with the basis as large as the budget ("no restart": the old
algorithm's iterates, its basis in float64 as before, here preallocated), and with
``--bases`` smaller ones in float64 and float32, from the same start vector and
``tol``. Printed per spectrum and basis: the relative error of the top eigenvalue
against ``torch.linalg.eigvalsh`` (float64), the products used, restarts, whether it
converged, and the vectors kept (the memory, in units of the parameter count).

    python bench/bench_lanczos.py [--dim 2000] [--max-iter 300] [--tol 1e-8] [--bases 40 20 10]
"""

from __future__ import annotations

import argparse

import torch

from sameloss.measures.curvature import MatrixOperator, lanczos_top_eigenvalue


def with_spectrum(eigenvalues: torch.Tensor, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    n = eigenvalues.numel()
    Q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return (Q * eigenvalues) @ Q.T


def spectra(dim: int) -> dict[str, torch.Tensor]:
    lin = lambda a, b, n: torch.linspace(a, b, n, dtype=torch.float64)  # noqa: E731
    i = torch.arange(1, dim + 1, dtype=torch.float64)
    return {
        "gap (10 vs <=5)": torch.cat([torch.tensor([10.0], dtype=torch.float64), lin(0, 5, dim - 1)]),
        "small gap (10, 9.9, <=9)": torch.cat([torch.tensor([10.0, 9.9], dtype=torch.float64), lin(0, 9, dim - 2)]),
        "cluster (6x 8.0, 4x 7.9)": torch.cat([torch.full((6,), 8.0, dtype=torch.float64),
                                               torch.full((4,), 7.9, dtype=torch.float64), lin(-1, 7, dim - 10)]),
        "power law + outliers": torch.cat([torch.tensor([50.0, 30.0, 29.0], dtype=torch.float64),
                                           10 * i[: dim - 3] ** -1.5 - 0.01 * (i[: dim - 3] % 7)]),
        "negative bulk (3 vs -40..2.5)": torch.cat([torch.tensor([3.0], dtype=torch.float64),
                                                     lin(-40, 2.5, dim - 1)]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dim", type=int, default=2000)
    parser.add_argument("--max-iter", type=int, default=300)
    parser.add_argument("--tol", type=float, default=1e-8)
    parser.add_argument("--bases", type=int, nargs="+", default=[40, 20, 10])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"dim {args.dim}, max_iter {args.max_iter}, tol {args.tol:g}; error = |θ − λ_max| / |λ_max| "
          "against eigvalsh (float64)")
    print(f"{'spectrum':<30} {'basis':<18} {'error':>9} {'products':>9} {'restarts':>9} {'conv':>5} {'vectors':>8}")
    for k, (name, eigenvalues) in enumerate(spectra(args.dim).items()):
        M = with_spectrum(eigenvalues, seed=k)
        exact = float(torch.linalg.eigvalsh(M)[-1])
        variants = [("no restart, float64", args.max_iter, M)]
        for b in args.bases:
            variants += [(f"{b}, float64", b, M), (f"{b}, float32", b, M.float())]
        for label, basis, matrix in variants:
            r = lanczos_top_eigenvalue(MatrixOperator(matrix), max_iter=args.max_iter,
                                       tol=max(args.tol, 1e-6 if matrix.dtype == torch.float32 else 0),
                                       generator=torch.Generator().manual_seed(0), basis_size=basis)
            kept = r.iterations + 1 if basis >= args.max_iter else r.basis_size
            print(f"{name:<30} {label:<18} {abs(r.eigenvalue - exact) / abs(exact):>9.1e} {r.iterations:>9} "
                  f"{r.restarts:>9} {'yes' if r.converged else 'no':>5} {kept:>8}", flush=True)


if __name__ == "__main__":
    main()
