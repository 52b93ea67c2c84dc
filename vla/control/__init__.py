"""Closed-loop control at a fixed rate: the controller, the robot interface and simulated inference delay."""
