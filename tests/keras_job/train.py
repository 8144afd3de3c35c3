"""One Dense layer fitted to random linear data on whichever backend tpuctl picked: says the backend Keras runs on
and the one tpuctl set, and fails unless they agree and the loss falls."""
import os
import time

import keras
import numpy as np

backend = keras.backend.backend()
print("keras", keras.__version__, "backend", backend, "KERAS_BACKEND", os.environ.get("KERAS_BACKEND"), flush=True)
assert backend == os.environ["KERAS_BACKEND"], (backend, os.environ["KERAS_BACKEND"])
rng = np.random.default_rng(0)
x = rng.normal(size=(256, 8)).astype("float32")
y = x @ rng.normal(size=(8, 1)).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
said = keras.callbacks.LambdaCallback(   # when each epoch's first step ended (the Kaggle test's time to first step)
    on_train_batch_end=lambda batch, logs: batch == 0 and print(f"first step at {time.time():.3f}", flush=True))
losses = model.fit(x, y, epochs=4, batch_size=32, verbose=0, callbacks=[said]).history["loss"]
for epoch, loss in enumerate(losses):
    print(f"epoch {epoch} loss {loss:.4f}", flush=True)
assert losses[-1] < losses[0], losses
print("loss fell", flush=True)
