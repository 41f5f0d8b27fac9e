"""The host API engines embed: the ``Treemail`` facade (``facade.py``), the one module that builds its services
(``wiring.py``) and the parts it is composed of. Its public address is ``treemail.host`` (and ``treemail``)."""
