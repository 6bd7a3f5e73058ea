r"""Fashion-MNIST (Xiao, Rasul and Vollgraf 2017: Zalando's 28x28 clothing images, 10
classes, 60,000 / 10,000): sequential pixel classification at 784 positions, MNIST's
protocol and arguments (configs/mnist.py: mini, runlocal, generation, causal, pretrain),
read from the original IDX files (lra/tasks/mnist.py FASHION_MNIST: Debian's
dataset-fashion-mnist package holds them, sha256 checked by scripts/fashion_mnist_files.py)
or a TFDS fashion_mnist/3.0.1 folder.

  apt-get download dataset-fashion-mnist && dpkg-deb -x dataset-fashion-mnist_*.deb /tmp/fm
  python launch.py --config=configs/fashion_mnist.py:model=transformer,mini \
      --config.data_dir=/tmp/fm/usr/share/datasets/fashion-mnist --workdir=workdirs/fm/t
"""
from configs import mnist


def get_config(arg: str | None = None):
    c = mnist.get_config(arg)
    c.task = "fashion_mnist"
    c.data_dir = "data/fashion_mnist"
    return c
