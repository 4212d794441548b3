"""Percentiles and the small summaries the load generator reports."""


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an already sorted list (nan when empty)."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, round(fraction * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


def latency_summary(latencies: list[float]) -> dict:
    """Count, mean, p50 and p99 of latencies in seconds."""
    values = sorted(latencies)
    return {
        "count": len(values),
        "mean": sum(values) / len(values) if values else float("nan"),
        "p50": percentile(values, 0.50),
        "p99": percentile(values, 0.99),
    }


def fmt_ms(seconds: float) -> str:
    """Seconds as milliseconds with two decimals."""
    return f"{seconds * 1000:.2f}"
