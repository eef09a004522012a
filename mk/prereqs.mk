# What `make test` needs from the machine besides Python: Java 17+ and Node.js with npm run DynamoDB Local for
# tests/aws. Checked before anything is installed, so a missing one is said at once, with what to install.
.PHONY: prereqs

prereqs:
	@$(PYTHON) tools/check_prereqs.py
