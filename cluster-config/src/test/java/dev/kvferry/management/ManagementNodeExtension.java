package dev.kvferry.management;

import org.junit.jupiter.api.extension.ExtensionContext;
import org.junit.jupiter.api.extension.ParameterContext;
import org.junit.jupiter.api.extension.ParameterResolver;

/**
 * Hands every test class the same {@link ManagementNode}, started on first use and closed by
 * JUnit when the whole run ends (it lives in the root store, and is AutoCloseable).
 */
public final class ManagementNodeExtension implements ParameterResolver {

  @Override
  public boolean supportsParameter(ParameterContext parameter, ExtensionContext context) {
    return parameter.getParameter().getType() == ManagementNode.class;
  }

  @Override
  public Object resolveParameter(ParameterContext parameter, ExtensionContext context) {
    return context
        .getRoot()
        .getStore(ExtensionContext.Namespace.create(ManagementNodeExtension.class))
        .getOrComputeIfAbsent(
            ManagementNode.class,
            key -> {
              try {
                return ManagementNode.start();
              } catch (ManagementStartException e) {
                throw new IllegalStateException(e.getMessage(), e);
              }
            },
            ManagementNode.class);
  }
}
