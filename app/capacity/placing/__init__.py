"""Placers: the inline placer, the placer registry, the batch planner and preemption."""
