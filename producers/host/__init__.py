"""The host API engines embed: the ``Treemail`` facade (``facade.py``), its bootstrap (``wiring.py``: the host's
services, then its parts over them) and the parts. Its public address is ``treemail.host`` (and ``treemail``)."""
