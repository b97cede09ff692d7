"""``tzoo reproduce``: what the papers and lectures claim, rerun as comparisons with a verdict.

A study is a compare spec, the claims it tests, where they come from, and what changes at each
scale. Its modules, one job each:

- :mod:`~transformer_zoo.comparing.studies.spec`: a study's file and its spec at each scale
  (:class:`~transformer_zoo.comparing.studies.spec.Study`, :func:`~transformer_zoo.comparing.studies.spec.load_study`).
- :mod:`~transformer_zoo.comparing.studies.sweeps`: a study's sweep of one training option, and
  each swept variant's sensitivity to it (:class:`~transformer_zoo.comparing.studies.sweeps.Sweep`).
- :mod:`~transformer_zoo.comparing.studies.verdicts`: each claim judged from the comparison's
  runs, and the study's outcome (:func:`~transformer_zoo.comparing.studies.verdicts.verdict`).
- :mod:`~transformer_zoo.comparing.studies.pages`: a study's ``verdict.md`` and the table of
  ``reproductions.md``.
- :mod:`~transformer_zoo.comparing.studies.running`: running studies, one after another or each
  in a process of its own (:func:`~transformer_zoo.comparing.studies.running.reproduce_all`).
"""
