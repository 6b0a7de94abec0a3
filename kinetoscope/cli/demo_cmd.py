"""`kscope demo`: a private daemon traces a real 2-rank DDP job with an emulated straggler."""

from __future__ import annotations

import typer

from kinetoscope.cli.examples import examples
from kinetoscope.errors import UsageError

EXAMPLES = examples(
    ("kscope demo", "2 ranks, an intermittent straggler, report in demo-output/"),
    ("kscope demo --ranks 4 --straggler persistent --workdir /tmp/demo", "4 ranks, one always slow"),
)


def register(app: typer.Typer) -> None:
    @app.command("demo", epilog=EXAMPLES)
    def demo(
        workdir: str = typer.Option(
            "demo-output", "--workdir", help="Where traces and logs go (kept afterwards)."
        ),
        ranks: int = typer.Option(
            2, "--world-size", metavar="N", help="Number of DDP ranks (processes). (Was --ranks.)"
        ),
        iterations: int = typer.Option(10, "--iterations", help="Training iterations to trace."),
        straggler: str = typer.Option(
            "intermittent", "--straggler", help="Emulated straggler: none, intermittent or persistent."
        ),
        straggler_rank: int = typer.Option(
            -1, "--straggler-rank", help="The straggling rank (-1: the last rank)."
        ),
        straggler_prob: float = typer.Option(
            0.3, "--straggler-prob", help="Intermittent: probability per step."
        ),
        model: str = typer.Option("small", "--model", help="MLP size: tiny, small, medium or large."),
        seed: int = typer.Option(0, "--seed", help="Seed of the data, weights and straggler schedule."),
        timeout: float = typer.Option(110.0, "--timeout", help="Give up after this many seconds."),
        catalog: str | None = typer.Option(
            None,
            "--catalog",
            help="Record the trace and its analysis in this catalog (default: WORKDIR/catalog.db).",
        ),
        report: bool = typer.Option(
            True, "--report/--no-report", help="Analyse, record and write the HTML report."
        ),
    ) -> None:
        """Run the end-to-end demo: daemon + DDP job + on-demand trace + diagnosis + report (about 30-60 s on 2 cores)."""
        import importlib.util

        if importlib.util.find_spec("torch") is None:  # the job is a real PyTorch job: say so up front
            raise UsageError(
                "kscope demo runs a real PyTorch job, and torch is not installed: `make demo` "
                "installs the CPU wheel (or: pip install torch==2.13.0)"
            )
        from kinetoscope.demo.driver import DemoOptions, run_demo
        from kinetoscope.demo.train_ddp import MODEL_SIZES, STRAGGLER_MODES

        if straggler not in STRAGGLER_MODES:
            raise UsageError(f"--straggler must be one of {', '.join(STRAGGLER_MODES)}, not {straggler!r}")
        if model not in MODEL_SIZES:
            raise UsageError(f"--model must be one of {', '.join(MODEL_SIZES)}, not {model!r}")
        if ranks < 1 or iterations < 1 or timeout <= 0:
            raise UsageError("--ranks, --iterations and --timeout must be positive")
        if not 0.0 <= straggler_prob <= 1.0:
            raise UsageError(f"--straggler-prob must be between 0 and 1, got {straggler_prob:g}")
        if straggler_rank >= ranks:
            raise UsageError(f"--straggler-rank {straggler_rank} does not exist with --ranks {ranks}")
        run_demo(
            DemoOptions(
                workdir=workdir,
                ranks=ranks,
                iterations=iterations,
                straggler=straggler,
                straggler_rank=straggler_rank,
                straggler_prob=straggler_prob,
                model=model,
                seed=seed,
                timeout_s=timeout,
                catalog=catalog,
                report=report,
            )
        )
