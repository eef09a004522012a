"""Locust load for the Keras benchmark server: POST one diabetes row, as JSON, to one endpoint.

Run by ``python -m benchmarks.run`` (``locust -f benchmarks/keras/locustfile.py --host http://127.0.0.1:8000``
by hand). The endpoint comes from ``LOCUST_ENDPOINT`` (default ``/predict``); ``LOCUST_WAIT`` is each user's
pause between requests in seconds (default 0: every user keeps one request in flight, a closed loop).
The file is no test module (pytest collects only ``test_*.py``) and imports neither TensorFlow nor the server:
locust runs in its own process, gevent and TensorFlow do not share one.
"""

from __future__ import annotations

import json
import os
import random

from locust import FastHttpUser, constant, task

ENDPOINT = os.environ.get("LOCUST_ENDPOINT", "/predict")
WAIT = float(os.environ.get("LOCUST_WAIT", "0"))

# Rows of scikit-learn's diabetes data (age, sex, bmi, bp, s1..s6, already scaled), inlined so that the load
# generator does not need scikit-learn; the model answers any 10 finite floats.
ROWS = [
    [0.0381, 0.0507, 0.0617, 0.0219, -0.0442, -0.0348, -0.0434, -0.0026, 0.0199, -0.0176],
    [-0.0019, -0.0446, -0.0515, -0.0263, -0.0084, -0.0192, 0.0744, -0.0395, -0.0683, -0.0922],
    [0.0853, 0.0507, 0.0445, -0.0057, -0.0456, -0.0342, -0.0324, -0.0026, 0.0029, -0.0259],
    [-0.0891, -0.0446, -0.0116, -0.0367, 0.0122, 0.0250, -0.0360, 0.0343, 0.0227, -0.0094],
    [0.0054, -0.0446, -0.0364, 0.0219, 0.0039, 0.0156, 0.0081, -0.0026, -0.0320, -0.0466],
    [-0.0927, -0.0446, -0.0407, -0.0194, -0.0690, -0.0792, 0.0413, -0.0764, -0.0412, -0.0963],
    [-0.0455, 0.0507, -0.0472, -0.0160, -0.0401, -0.0248, 0.0008, -0.0395, -0.0630, -0.0384],
    [0.0635, 0.0507, -0.0019, 0.0666, 0.0906, 0.1089, 0.0229, 0.0177, -0.0358, 0.0031],
]
BODIES = [json.dumps(row).encode() for row in ROWS]
HEADERS = {"Content-Type": "application/json"}


class PredictUser(FastHttpUser):
    wait_time = constant(WAIT)

    @task
    def post_row(self) -> None:
        # Pre-encoded bodies: the load generator shares the machine's cores with the server, so spend little.
        self.client.post(ENDPOINT, data=random.choice(BODIES), headers=HEADERS)
