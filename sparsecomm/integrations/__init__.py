"""Optional integrations of sparsecomm with training frameworks.

Each module here is imported only when its framework is installed (importing it without the
framework raises ImportError naming the pip extra), and the library core never imports them:
``import sparsecomm`` works, and behaves the same, with or without any framework.

* :mod:`sparsecomm.integrations.lightning`: PyTorch Lightning (``pip install sparsecomm[lightning]``).
* :mod:`sparsecomm.integrations.accelerate`: Hugging Face Accelerate (``pip install sparsecomm[accelerate]``).
"""
