"""Pure scheduling policy: quota, placement, victim choice and the priority weight."""

from hai_airflow.scheduling.planner import plan
from hai_airflow.scheduling.policies import POLICIES, Policy
from hai_airflow.scheduling.quota import QuotaVerdict, high_priority_allowed
from hai_airflow.scheduling.weight import Weight, WeightTerm, weight

__all__ = [
    "POLICIES",
    "Policy",
    "QuotaVerdict",
    "Weight",
    "WeightTerm",
    "high_priority_allowed",
    "plan",
    "weight",
]
