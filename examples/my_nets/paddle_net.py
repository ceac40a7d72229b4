# The same model ported to Paddle by hand: the same layers in the same order, named its own way.
import paddle


class PaddleNet(paddle.nn.Layer):
    def __init__(self, num_classes=10, image_size=32, width=16):
        super().__init__()
        self.stem = paddle.nn.Conv2D(3, width, 3, padding=1, bias_attr=False)
        self.stem_norm = paddle.nn.BatchNorm2D(width)
        self.down = paddle.nn.Conv2D(width, 2 * width, 3, stride=2, padding=1, bias_attr=False)
        self.down_norm = paddle.nn.BatchNorm2D(2 * width)
        self.pool = paddle.nn.AdaptiveAvgPool2D(1)
        self.hidden = paddle.nn.Linear(2 * width, 64)
        self.head = paddle.nn.Linear(64, num_classes)

    def forward(self, x):
        x = paddle.nn.functional.relu(self.stem_norm(self.stem(x)))
        x = paddle.nn.functional.relu(self.down_norm(self.down(x)))
        x = paddle.flatten(self.pool(x), 1)
        return self.head(paddle.nn.functional.relu(self.hidden(x)))


def build(num_classes, image_size, width=16):
    return PaddleNet(num_classes, image_size, width)
