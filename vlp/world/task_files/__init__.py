"""The shapes world's downstream tasks, each written in the format of its real counterpart
(:mod:`vlp.data`): ``vqa``, ``nlvr``, ``grounding``, ``ve`` and ``classification``
(:func:`vlp.world.writer.generate_world` writes them all)."""
