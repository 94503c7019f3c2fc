"""The plan as `cloudtrain plan` and `run` print it: a table of the nodes, the totals, the
alternatives, the provider options in effect and the planner's notes. Imports rich's table and
text only, so `plan` loads none of the live view's modules (`cloudtrain.cli.ui`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from cloudtrain.plan.planner import Plan


def plan_table(plan: Plan) -> Group:
    """The plan as a table plus totals, alternatives and notes."""
    table = Table(title=f"plan for {plan.run_name} on {plan.provider}", title_justify="left")
    for col in ("role", "nodes", "instance", "accelerator", "spot", "zone", "$/h each"):
        table.add_column(col, justify="right" if col in ("nodes", "$/h each") else "left")
    for role, count in plan.roles().items():
        node = next(n for n in plan.nodes if n.role == role)
        accel = f"{node.accelerator}x{node.accelerator_count}" if node.accelerator else "-"
        table.add_row(
            role,
            str(count),
            node.instance_type,
            accel,
            "yes" if node.spot else "no",
            node.zone or plan.region,
            f"{node.price_hourly:.4f}",
        )
    lines: list[Any] = [table]
    budget = f" (budget ${plan.max_cost_usd:.2f})" if plan.max_cost_usd is not None else ""
    lines.append(
        Text(
            f"strategy {plan.strategy}, {plan.node_count} node(s) in {plan.region}: "
            f"${plan.hourly_usd:.4f}/h, at most ${plan.estimate_usd:.2f} "
            f"for max_hours {plan.max_hours:g}{budget}"
        )
    )
    for alt in plan.alternatives:
        lines.append(Text(f"  alternative: {alt.description}: ${alt.hourly_usd:.4f}/h", "dim"))
    for opt in plan.provider_options:
        value = "-" if opt.value is None else str(opt.value)
        where = f" ({opt.where})" if opt.where else ""
        lines.append(Text(f"  {plan.provider}.{opt.name}: {value}  [{opt.source}{where}]", "dim"))
    for note in plan.notes:
        lines.append(Text(f"  note: {note}", "yellow"))
    return Group(*lines)
