"""The check kit: the building blocks every ``grader/checks/NN_name.py`` is written with.

- :mod:`grader.kit.cases`: seeded case generation (``randint``, ``uniform``, ``choice``, ``randn``);
- :mod:`grader.kit.close`: numeric closeness, one tolerance policy per kind of number;
- :mod:`grader.kit.kernels`: one observed call of a kernel wrapper and the verdict ladder (labs 02-08);
- :mod:`grader.runs.ranks`: learner code on real ranks, one policy for stubs, errors and hangs (labs 11-13);
- :mod:`grader.kit.variants`: "your output matches the X variant instead".

What an exercise *is* (``Exercise``, ``Case``, ``Benchmark``, ``Neutral``) lives in
:mod:`grader.exercise`; every hook into Triton and PyTorch internals in :mod:`gpulab.launches`.
``grader/README.md`` shows how a lab's check file is written with them.
"""
