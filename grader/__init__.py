"""The GPU Systems Lab grader: release labs, grade submissions, merge cohorts (see README)."""
