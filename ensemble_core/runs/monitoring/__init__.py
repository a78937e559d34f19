"""Monitoring unlabelled data with the champion: one drop scored (drop.py), the nights
recorded (history.py), the steps on files (monitor.py)."""
