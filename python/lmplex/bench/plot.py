"""PNG figures of a ``lmplex bench`` result (matplotlib, Agg): one per workload.

- ``decode.png``: tokens/s by system and model, with the decode roofline as a line per model.
- ``prefill.png``: tokens/s by prompt length and system.
- ``throughput.png``: generated tokens/s over the synthetic mix, by system.
- ``batched.png``: lmplex's decode tokens/s at batch 1 and with N requests at once, by model.
- ``online.png``: time-to-first-token and inter-token latency percentiles by arrival rate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_all"]


def plot_all(result: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    machine = result["machine"]
    subtitle = (
        f"{machine['cpu']}, {machine['threads']} threads, {machine['memory_bandwidth_gb_s']} GB/s measured"
    )
    written: list[Path] = []
    bars = {
        "decode": ("generated_tokens", "decode_tok_s"),
        "prefill": ("prompt_tokens", "prefill_tok_s"),
        "throughput": ("requests", "tok_s"),
    }
    for workload, (size_key, value_key) in bars.items():
        groups = [(run["model"], row) for run in result["runs"] for row in run["results"].get(workload, [])]
        if not groups:
            continue
        groups = [(m.removesuffix("-instruct"), row) for m, row in groups]
        labels = sorted({f"{m}\n{workload} {row[size_key]}" for m, row in groups})
        systems = sorted({row["system"] for _, row in groups}, key=lambda s: (s != "lmplex", s))
        fig, ax = plt.subplots(figsize=(max(6, 1.8 * len(labels)), 4.5))
        width = 0.8 / len(systems)
        for j, system in enumerate(systems):
            values = []
            for label in labels:
                hit = [
                    row[value_key]
                    for m, row in groups
                    if f"{m}\n{workload} {row[size_key]}" == label and row["system"] == system
                ]
                values.append(hit[0] if hit else 0.0)
            ax.bar([i + j * width for i in range(len(labels))], values, width, label=system)
        if workload == "decode":
            for i, label in enumerate(labels):
                roof = [
                    row["roofline_tok_s"] for m, row in groups if f"{m}\n{workload} {row[size_key]}" == label
                ]
                ax.hlines(
                    roof[0],
                    i - width / 2,
                    i - width / 2 + 0.8,
                    colors="black",
                    linestyles="dashed",
                    label="roofline" if i == 0 else "_nolegend_",
                )
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(labels))], labels, fontsize=8)
        ax.set_ylabel("tokens/s")
        ax.set_title(f"{workload}\n{subtitle}", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{workload}.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    batched = [(run["model"], row) for run in result["runs"] for row in run["results"].get("batched", [])]
    if batched:
        fig, ax = plt.subplots(figsize=(max(6, 2.4 * len(batched)), 4.5))
        xs = range(len(batched))
        ax.bar([x - 0.2 for x in xs], [r["batch1_decode_tok_s"] for _, r in batched], 0.4, label="batch 1")
        ax.bar(
            [x + 0.2 for x in xs], [r["decode_tok_s"] for _, r in batched], 0.4, label="N requests at once"
        )
        labels = [
            f"{m.removesuffix('-instruct')}\nN={r['concurrency']}: {r['speedup_vs_batch1']:.2f}x"
            for m, r in batched
        ]
        ax.set_xticks(list(xs), labels, fontsize=8)
        ax.set_ylabel("decode tokens/s")
        ax.set_title(f"batched decode (lmplex)\n{subtitle}", fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / "batched.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    online = [(run["model"], row) for run in result["runs"] for row in run["results"].get("online", [])]
    if online:
        fig, axes = plt.subplots(1, 2, figsize=(10, 4))
        for ax, key, title in [
            (axes[0], "ttft_s", "time to first token"),
            (axes[1], "itl_s", "inter-token latency"),
        ]:
            for model in sorted({m for m, _ in online}):
                rows = sorted((r for m, r in online if m == model), key=lambda r: r["rate_rps"])
                for p in ("p50", "p90", "p99"):
                    ax.plot(
                        [r["rate_rps"] for r in rows],
                        [r[key].get(p, 0) for r in rows],
                        marker="o",
                        label=f"{model} {p}",
                    )
            ax.set_xlabel("arrival rate (requests/s)")
            ax.set_ylabel("seconds")
            ax.set_title(f"{title} (lmplex)", fontsize=9)
            ax.legend(fontsize=7)
        fig.suptitle(subtitle, fontsize=8)
        fig.tight_layout()
        path = out_dir / "online.png"
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
